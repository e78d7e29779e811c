"""Engine facts: what each inference engine is, as data (no logic, no imports).

One module per engine. The rules (`localmodel.rules`), the renderer
(`localmodel.render`) and the API defaults all read these, so a port, a path,
an image or a library name is written exactly once.
"""
