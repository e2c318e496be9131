"""Training budgets of the LoFAST models per scale, as grid entries ({key: [value]}) the lofast_* experiments
splice into their grid / quick / test, so --dry-run, --set and the manifest see them. The bound studies
(lofast_tightness, lofast_input_norm, lofast_ablation) use lofast_certified's L2-h8-c0.5 ViT: with the same
budget at a scale they load the model lofast_certified trained (same artifact key).

The ViT grids name the paper's data, CIFAR-10 (32x32x3, patch 8: 16 patches). Where CIFAR-10 cannot be obtained
the planner runs the declared substitute VIT_SUBSTITUTE instead: Fashion-MNIST (28x28x1) with the patch of the same
patch count (8 -> 7: 16 patches, 4 -> 4: 64 vs 49, 16 -> 14: 4), recorded per cell (harness.run.substitutes)."""
from harness.catalog import Substitute

VIT_FULL = {"dataset": ["cifar10"], "train_size": [20000], "test_size": [10000], "epochs": [2], "patch": [8],
            "lr": [3e-3]}
VIT_QUICK = {"dataset": ["cifar10"], "train_size": [6000], "test_size": [2000], "epochs": [2], "patch": [8],
             "lr": [1e-2]}
VIT_TEST = {"dataset": ["synthetic"], "train_size": [128], "test_size": [32], "epochs": [1], "patch": [14],
            "lr": [3e-3]}
# --scale paper: all of CIFAR-10 (50,000 train, 10,000 test). The paper gives no epoch count or learning rate for
# its ViTs; 50 epochs at the full scale's rate is our choice.
VIT_PAPER = {"dataset": ["cifar10"], "train_size": [50000], "test_size": [10000], "epochs": [50], "patch": [8],
             "lr": [3e-3]}
VIT_SUBSTITUTE = Substitute("dataset", "cifar10", "fashion_mnist", label="CIFAR-10", use_label="Fashion-MNIST",
                            also={"patch": {8: 7, 4: 4, 16: 14}})

TEXT_FULL = {"dataset": ["sst2"], "train_size": [8000], "test_size": [872], "epochs": [2], "lr": [1e-2]}
TEXT_QUICK = {"dataset": ["sst2"], "train_size": [4000], "test_size": [872], "epochs": [2], "lr": [1e-2]}
TEXT_TEST = {"dataset": ["synthetic"], "train_size": [128], "test_size": [32], "epochs": [1], "lr": [1e-2]}
