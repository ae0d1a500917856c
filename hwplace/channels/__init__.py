"""Layer 6b, channels: the weighted queue logic, load balancing, the wire, the host and the client. Beside
:mod:`hwplace.planning`; neither imports the other. Imports the layers below."""
