"""The engine: a model run under many masks at once, placed on a mesh. One job per module (scoring `scorer`,
generation `generator`, attribution `attribution`) over pure jittable functions (`scoring_kernels`,
`generation_kernels`), sharing one `resources.SharedResources` (placement, planner, layouts, residual cache); `Engine`
(`engine.py`) is the facade."""
