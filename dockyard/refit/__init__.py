"""dockyard.refit"""
