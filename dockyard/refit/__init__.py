"""dockyard.refit: trainer -> engine weight movement.

synchronizer.py (`WeightSynchronizer`, `create_weight_synchronizer`), transports.py (in-process,
object store, shared memory, HTTP), nccl.py (collective broadcast), http_receiver.py (the HTTP
receiving end), canary.py (the post-sync logprob check). name_map.py is the trainer's (HF names).
"""
