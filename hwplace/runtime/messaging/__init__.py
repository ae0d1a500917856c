"""The messaging room: what ``Worker.send``, ``recv`` and ``broadcast`` run. ``communicator`` builds a process
group of any members from hwplace's placements (through the executor's rendezvous) and frames what travels on
it; ``messenger`` keeps one pair per peer and the broadcast sets. Imports the layers below the runtime; nothing
else of the runtime."""
