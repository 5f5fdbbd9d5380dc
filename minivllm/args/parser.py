"""`FlexibleArgumentParser`: argparse with vLLM's flag spellings and one-line errors.

On top of argparse:

- ``--max_model_len`` is the same flag as ``--max-model-len``;
- ``-cc.key=value``, ``-cc.a.b=value`` and ``--compilation-config.key value``
  become JSON pieces of ``--compilation-config`` (values are JSON when they
  parse, strings otherwise); all pieces of one flag merge in order, and the
  parsed value is the config object built from them (``args.compilation_config.mode``),
  or the default config when the flag is absent, as in vLLM;
- ``--config file.yaml`` expands the file's keys into flags placed before the
  command line, so flags given explicitly win;
- errors are one line on stderr and exit status 2, with a "did you mean" for
  misspelt flags.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from minivllm.args.parsing import MergeJsonAction, build_config_flags, parse_json_or_str

_DOTTED = re.compile(r"^(?P<flag>--?[A-Za-z][\w-]*)\.(?P<key>[A-Za-z_][\w.-]*)(?:=(?P<value>.*))?$")
"""``-cc.a.b=value`` or ``--compilation-config.a.b`` (value in the next token)."""


class FlexibleArgumentParser(argparse.ArgumentParser):
    """`argparse.ArgumentParser` with vLLM's flag spellings and one-line errors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._config_file_flag: str | None = None

    # -- registration -----------------------------------------------------
    def add_config_file_argument(self, flag: str = "--config") -> None:
        """Register ``--config FILE`` (YAML or JSON; keys are flag names)."""
        self.add_argument(
            flag,
            metavar="FILE",
            help="Read flags from a YAML file whose keys are flag names (dashes or "
            "underscores); flags given on the command line win over the file.",
        )
        self._config_file_flag = flag

    # -- parsing ------------------------------------------------------------
    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        argv = list(sys.argv[1:] if args is None else args)
        argv = self._normalize_underscores(argv)
        if self._config_file_flag is not None:
            argv = self._expand_config_files(argv)
        argv = self._expand_dotted(argv)
        parsed, rest = super().parse_known_args(argv, namespace)
        try:
            build_config_flags(self, parsed)
        except argparse.ArgumentError as exc:
            self.error(str(exc))
        return parsed, rest

    def error(self, message: str) -> NoReturn:
        """Print ONE line (no usage block) and exit with status 2."""
        text = " ".join(message.split())
        if text.startswith("unrecognized arguments:"):
            text += self._suggestion(text.split(":", 1)[1].split())
        self.exit(2, f"{self.prog}: error: {text}\n")

    def _suggestion(self, unknown: list[str]) -> str:
        flags = [s for s in self._option_string_actions if s.startswith("--")]
        for token in unknown:
            close = difflib.get_close_matches(token.split("=", 1)[0], flags, n=1)
            if close:
                return f" (did you mean {close[0]}?); see --help"
        return "; see --help"

    def _normalize_underscores(self, argv: list[str]) -> list[str]:
        out: list[str] = []
        for i, token in enumerate(argv):
            if token == "--":
                return out + argv[i:]
            if token.startswith("--") and token.split("=", 1)[0] not in self._option_string_actions:
                head, sep, tail = token.partition("=")
                flag, dot, key = head.partition(".")
                token = flag.replace("_", "-") + dot + key + sep + tail
            out.append(token)
        return out

    def _dict_flags(self) -> dict[str, argparse.Action]:
        return {
            s: a for s, a in self._option_string_actions.items() if isinstance(a, MergeJsonAction)
        }

    def _expand_dotted(self, argv: list[str]) -> list[str]:
        """``-cc.a.b=v`` / ``--compilation-config.a.b v`` -> ``--compilation-config '{"a":{"b":v}}'``."""
        dict_flags = self._dict_flags()
        if not dict_flags:
            return argv
        out: list[str] = []
        i = 0
        while i < len(argv):
            token = argv[i]
            if token == "--":
                return out + argv[i:]
            match = _DOTTED.match(token)
            if match is None or match["flag"] not in dict_flags:
                out.append(token)
                i += 1
                continue
            value = match["value"]
            if value is None:
                if i + 1 >= len(argv):
                    self.error(f"argument {match['flag']}.{match['key']}: expected a value")
                value = argv[i + 1]
                i += 1
            nested: Any = parse_json_or_str(value)
            for part in reversed(match["key"].replace("-", "_").split(".")):
                nested = {part: nested}
            out += [dict_flags[match["flag"]].option_strings[-1], json.dumps(nested)]
            i += 1
        return out

    def _expand_config_files(self, argv: list[str]) -> list[str]:
        """Pull out every ``--config FILE`` and put the file's flags first."""
        flag = self._config_file_flag
        assert flag is not None
        from_files: list[str] = []
        rest: list[str] = []
        i = 0
        while i < len(argv):
            token = argv[i]
            if token == "--":
                rest += argv[i:]
                break
            if token == flag or token.startswith(flag + "="):
                if token == flag:
                    if i + 1 >= len(argv):
                        self.error(f"argument {flag}: expected the path of a YAML file")
                    path = argv[i + 1]
                    i += 1
                else:
                    path = token.split("=", 1)[1]
                from_files += self._config_file_args(path)
            else:
                rest.append(token)
            i += 1
        return from_files + rest

    def _config_file_args(self, path: str) -> list[str]:
        import yaml

        flag = self._config_file_flag
        file = Path(path)
        if not file.is_file():
            self.error(f"argument {flag}: file {path!r} not found; pass the path of a YAML file")
        try:
            data = yaml.safe_load(file.read_text()) or {}
        except yaml.YAMLError as exc:
            self.error(f"argument {flag}: {path!r} is not valid YAML: {' '.join(str(exc).split())}")
        if not isinstance(data, dict):
            self.error(f"argument {flag}: {path!r} must hold a mapping of flag names to values")
        args: list[str] = []
        for key, value in data.items():
            args += self._file_entry_args(str(key), value, path)
        return args

    def _file_entry_args(self, key: str, value: Any, path: str) -> list[str]:
        base, dot, sub = key.partition(".")
        name = "--" + base.replace("_", "-")
        action = self._option_string_actions.get(name)
        if action is None or (dot and not isinstance(action, MergeJsonAction)):
            self.error(
                f"argument {self._config_file_flag}: unknown key {key!r} in {path!r} "
                f"(no flag {name}); keys are flag names, see --help"
            )
        if value is None:
            return []
        if dot:
            return [f"{name}.{sub}", json.dumps(value)]
        if isinstance(action, argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                self.error(f"argument {name}: expected true or false in {path!r}, got {value!r}")
            return [name] if value else ["--no-" + base.replace("_", "-")]
        if isinstance(value, (dict, list)) and (
            isinstance(action, MergeJsonAction) or not action.nargs
        ):
            return [name, json.dumps(value)]
        if isinstance(value, list):
            return [name, *(json.dumps(v) if isinstance(v, bool) else str(v) for v in value)]
        if isinstance(value, bool):
            return [name, "true" if value else "false"]
        return [name, str(value)]
