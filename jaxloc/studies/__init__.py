"""Studies built on localization runs: heads against neurons at equal budgets (`heads_vs_neurons`) and fine-tuning
the located neurons (`finetune`)."""
