"""Training budgets of the LoFAST models per scale, as grid entries ({key: [value]}) the lofast_* experiments
splice into their grid / quick / test, so --dry-run, --set and the manifest see them. The bound studies
(lofast_tightness, lofast_input_norm, lofast_ablation) use lofast_certified's L2-h8-c0.5 ViT: with the same
budget at a scale they load the model lofast_certified trained (same artifact key)."""

VIT_FULL = {"dataset": ["fashion_mnist"], "train_size": [20000], "test_size": [10000], "epochs": [2], "patch": [7],
            "lr": [3e-3]}
VIT_QUICK = {"dataset": ["fashion_mnist"], "train_size": [6000], "test_size": [2000], "epochs": [2], "patch": [7],
             "lr": [1e-2]}
VIT_TEST = {"dataset": ["synthetic"], "train_size": [128], "test_size": [32], "epochs": [1], "patch": [14],
            "lr": [3e-3]}

TEXT_FULL = {"dataset": ["sst2"], "train_size": [8000], "test_size": [872], "epochs": [2], "lr": [1e-2]}
TEXT_QUICK = {"dataset": ["sst2"], "train_size": [4000], "test_size": [872], "epochs": [2], "lr": [1e-2]}
TEXT_TEST = {"dataset": ["synthetic"], "train_size": [128], "test_size": [32], "epochs": [1], "lr": [1e-2]}
