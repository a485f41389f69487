"""A Lasso library in JAX: FISTA fits, regularization paths and K-fold cross-validation under `jax.vmap`
(`solver`, whose iteration at one alpha is `fista`), the scikit-learn cross-check (`crosscheck`) and stability
selection (`stability`). It knows nothing of models: a design matrix X [masks, features] and scores y [masks] go
in, coefficients come out."""
