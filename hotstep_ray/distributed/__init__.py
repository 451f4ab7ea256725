"""The Ray shell: starting/joining Ray and fanning plain-Python work out over it.

Nothing in the stage packages imports Ray; they take a `map_fn` (or a config) and this package
supplies the distributed version.
"""
