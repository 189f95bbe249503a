"""dockyard.trainer_torch"""
