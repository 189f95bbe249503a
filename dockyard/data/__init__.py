"""dockyard.data"""
