"""Sokoban (spec F.1) in pure JAX: rules (`dynamics`), level generation (`generator`) and an exact BFS
solver (`solver`)."""
