"""Layer 3, the plugin manager: finds plugins, collects what their hooks provide, runs detection in bounded
time, and remembers this process's executor. Imports the contracts and the foundation."""
