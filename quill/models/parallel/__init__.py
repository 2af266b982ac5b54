"""A decoder-only Transformer split over the ranks of a tensor-parallel group (Megatron's split, as vLLM makes it).

plan.py           which rows or columns of each parameter a rank holds; what cannot be split
shard_loading.py  a rank's shard read from the checkpoint, slice by slice
collectives.py    the group's all-reduce, broadcast and gather (gloo on the CPU, NCCL on CUDA)
hooks.py          what a sharded step does differently: partial sums reduced, vocabulary-split embedding and logits

The engine's side (starting ranks, sending them each step) is quill/server/engine/parallel.
"""
