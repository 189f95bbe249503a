"""dockyard.sandbox"""
