"""The int8 engine, as precision/ is fp16's: measure the parts, choose within the error budget, rewrite, report.

engine.py runs the steps (what :mod:`onnxsmith.transforms.int8` declares); parts.py holds what each Linear, table
and Conv is and what decided it; forms.py how a Linear may be made (smoothed, outliers apart, error-compensated
rounding); convs.py which Convs may go; search.py the end-to-end choice and the speed trim; measure.py and
speed.py the probes that run the model in onnxruntime; report.py the report's words.
"""
