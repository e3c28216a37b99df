"""Tree construction and interaction lists (all jit-able)."""
from jfmm.tree.uniform import Tree, build, choose_depth, crowding, root_box

__all__ = ["Tree", "build", "choose_depth", "crowding", "root_box"]
