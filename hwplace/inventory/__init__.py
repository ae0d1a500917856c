"""Layer 5, inventory: the :class:`~hwplace.Cluster` (its nodes and what was detected on each), detection on a
node, and offline inventories planned on paper. Imports the layers below."""
