"""Test-wide settings.

Toy models and tiny HF models make thousands of tiny tensor ops; with more
than one intra-op thread each op pays thread wake-up costs that dominate
(measured: torch.softmax on a [1, 4] float64 tensor took 4 ms with 2 threads
on a loaded 2-core machine, 0.02 ms with 1). Real-model speed is measured by
`exactspec bench`, never here.
"""

import torch

torch.set_num_threads(1)
