"""Which sample comes next: permutations, epoch orders and ``ResumableSampler``.

Pure arithmetic on sample numbers, no I/O at all: a permutation of ``N`` in O(1)
memory (``permutation``, in C where ``extensions`` loads ``_permute.c``), block orders
(``epoch``), the resumable, elastic sampler (``sampler``), its state dict's checks
(``state``) and world size (``world``), and mixtures: an epoch's interleaving of parts
and their passes (``mixture``), their weights, counts and schedules (``weights``);
batches of one bucket each (``buckets``); sequence packs planned from documents'
lengths (``packing``, in C where ``extensions`` loads ``_pack.c``).

May import: the shared modules (``indextar.errors``).
Must not import: any other room.
"""
