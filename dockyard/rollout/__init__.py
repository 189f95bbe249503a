"""dockyard.rollout"""
