"""dockyard.trainer_jax"""
