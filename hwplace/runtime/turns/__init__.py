"""The turns room: the arbiter of a node (``arbiter``: the pure ``TurnTable`` and the ``TurnServer`` an executor
runs) and a worker's side of ``with self.turn():`` (``client``). Imports the layers below the runtime; nothing
else of the runtime."""
