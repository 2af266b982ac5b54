"""Tensor parallelism: one model split over several ranks (processes, a device each), stepped as one.

Rank 0 is the engine's own process: it schedules, sends each step's input to the other ranks and samples; every rank
runs its shard of the step (quill/models/parallel: the split, the collectives, reading a shard's slices).

config.py        how many ranks, and who starts them
launch.py        loading: refusals first, then the ranks started, their shards loaded, the group met
ranks.py         the other ranks as rank 0 holds them: the store they meet at, the processes it started
driver.py        rank 0's model: sends each step and its cache operations, runs its shard, returns whole logits
channel.py       rank 0's messages: JSON headers through the store, each step's tensors broadcast
step_message.py  a step's input packed for the other ranks, and unpacked there
worker.py        a rank past 0: load its shard, follow rank 0's steps (`quill tp-worker`)
"""
