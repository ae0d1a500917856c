"""Layer 6a, planning: resources of node groups, placements, the Packed / Flexible / Node strategies and
``ComponentPlacement``. Beside :mod:`hwplace.channels`; neither imports the other. Imports the layers below."""
