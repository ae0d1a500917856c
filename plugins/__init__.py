"""hwplace's built-in plugins, installed as ``hwplace_plugins``.

Each one is registered through the ``hwplace`` entry-point group and uses only hwplace's public API,
exactly as a vendor's package would.
"""
