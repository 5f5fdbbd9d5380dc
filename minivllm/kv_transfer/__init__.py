"""KV connectors: KV blocks moved between the KV pool and the outside.

`base` is the interface (scheduler half torch-free, as the scheduler imports it);
`scheduler_side` builds a connector's scheduler half, `worker_side` its worker half.
Connectors: `storage` (ExampleConnector: a directory of checksummed block files),
`offloading` (OffloadingConnector: host-memory and disk tiers, LRU), `tcp`
(TcpConnector: disaggregated prefill between two engines).
"""
