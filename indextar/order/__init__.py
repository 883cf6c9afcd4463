"""Which sample comes next: permutations, epoch orders and ``ResumableSampler``.

Pure arithmetic on sample numbers, no I/O at all: a permutation of ``N`` in O(1)
memory (``permutation``), block orders (``epoch``), the resumable, elastic sampler
(``sampler``) and its state dict's checks (``state``). Mixtures and buckets belong
here too.

May import: the shared modules (``indextar.errors``).
Must not import: any other room.
"""
