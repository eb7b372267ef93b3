"""What a mechanism is: `spec` (the validated numbers), `expressions` (the safe YAML expression
evaluator), `loader` (YAML -> spec, one-line errors), `mechanism` (`Mechanism`, `load_mechanism`) and
`constraints` (one class per constraint type, assembled by `ConstraintSet`, which the compiled kernel
evaluates, as it does `friction`'s force). Imports nothing else of the package but `native` (the kernel, which
imports nothing of it)."""
