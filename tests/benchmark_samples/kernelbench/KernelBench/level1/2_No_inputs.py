import torch.nn as nn


class Model(nn.Module):
    """A problem file without get_inputs / get_init_inputs (malformed)."""
