"""Pure torch kernels: no I/O, device/dtype follow the inputs, batched over leading dims."""
from .attention import AttentionWeights, attention, probs, scores, causal_mask, augment_input
from .power import top_singular_value, jacobian_norm, operator_norm, PowerResult, NonConvergenceWarning
from .softmax import softmax_jacobian, jsm_norm, jsm_norm_dense, g_k
from .linalg import prod_norm, spec
from .pgd import pgd_maximize, random_search_maximize, project_ball
