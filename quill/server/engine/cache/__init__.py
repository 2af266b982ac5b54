"""Where each sequence's cache lives: the managers of paged K,V blocks and state slots, the prefix keys, the
runner's device table of them, and how many bytes the cache gets."""
