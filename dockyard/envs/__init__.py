"""dockyard.envs"""
