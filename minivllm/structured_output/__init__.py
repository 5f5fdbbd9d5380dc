"""Structured outputs: grammars compiled by xgrammar or llguidance, and the per-request
matchers whose token bitmasks constrain sampling.

`manager.StructuredOutputManager` (owned by the engine) compiles a request's grammar
once, cached by its text; the worker keeps one matcher per request (`GrammarMatcher`),
fills the step's bitmask from the matchers (`bitmask.GrammarBitmask`) and advances
them on the sampled tokens.
"""
