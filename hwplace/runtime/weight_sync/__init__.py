"""The weight-sync room: ``hwplace.WeightSync`` (``sync``), the buckets and digests every version is packed into
(``buckets``), the links that announce versions (``links``), and where the bytes lie on the way: the node's
shared-memory segments (``segments``) and device slots shared through CUDA IPC (``device_share``). Imports the
layers below the runtime and :mod:`hwplace.runtime.messaging.communicator` (its links are communicators)."""
