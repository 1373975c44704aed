"""Rules: the judgements that checks and tuning share, as pure functions of facts.

One module per subject: `nccl_settings` (NCCL, CUDA and torch.distributed variables),
`allocator_settings` (the PyTorch caching allocator's configuration), `variable_judges`
(which of those judges each variable goes to: the one dispatch the nccl_env and
torch_alloc checks and `tune`'s removals share), `gpu_peaks` (what a GPU model should
reach). A rule takes facts (a Setting, the inventory's network facts, the RoCE GID
tables, the NCCL version) and returns findings; it never reads the node, so it is
tested on a literal facts object.
"""
