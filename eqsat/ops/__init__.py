"""The op table, the single declaration of every op (shape rule, cost class, lowering), with its kernels."""
