"""The messaging room: what ``Worker.send``, ``recv`` and ``broadcast`` run. ``communicator`` builds a process
group of any members from hwplace's placements (through the executor's rendezvous) and frames what travels on
it; ``pair`` is one worker and one peer (its receiving thread, its waiting recvs), ``devices`` the GPU side of a
pair (where tensors land, NCCL groups per direction, transfers watched); ``messenger`` keeps one pair per peer
and the broadcast sets. Imports the layers below the runtime; nothing
else of the runtime."""
