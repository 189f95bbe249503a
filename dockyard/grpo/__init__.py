"""dockyard.grpo"""
