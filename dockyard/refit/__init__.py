"""dockyard.refit: trainer -> engine weight movement (transports, synchronizer, canary)."""
