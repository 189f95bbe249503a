"""dockyard.refit: trainer -> engine weight movement.

synchronizer.py (`WeightSynchronizer`, `create_weight_synchronizer`), transports.py (in-process,
object store, shared memory), nccl.py (collective broadcast), canary.py (the post-sync logprob
check). refit depends on the rollout side (it moves weights into engines), never the reverse: the
wire format both ends share is `dockyard.rollout.wire`; the HF names are `dockyard.models.name_map`.
"""
