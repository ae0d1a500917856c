"""The weight-sync room: ``hwplace.WeightSync`` (``sync``), one class per transport and the one place that chooses
a target's transport for a version (``transports``), a target's side that takes versions when it asks
(``intake``), the links that announce versions (``links``), the buckets and digests every host version is packed
into (``buckets``), and where the bytes lie on the way: the node's shared-memory segments (``segments``) and
the source's ring of device buckets shared through CUDA IPC (``device_ring``, on the device-share primitives of
``device_share``) under their locks (``slot_lock``). Imports the layers below the runtime and
:mod:`hwplace.runtime.messaging.communicator` (its links are communicators)."""
