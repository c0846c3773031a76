"""What each DVC stage does, as functions of (params, project root, dataset, seed...); ``stages/<stage>.py`` only
parses its command line (:mod:`pipeline.cli`) and calls one of these.

One module per stage family, and each stage imports only its own (this package re-exports nothing), so that each
stage of dvc.yaml depends on the code it runs and no more (``tests/test_pipeline_e2e.py`` checks it):

* :mod:`pipeline.workflow.paths`       the layout of every artifact (the table there);
* :mod:`pipeline.workflow.data`        ``download``, ``preprocess``/``synthesize``;
* :mod:`pipeline.workflow.spectral`    ``features``, ``two_stage``, ``decompose``;
* :mod:`pipeline.workflow.initialise`  ``initialise``;
* :mod:`pipeline.workflow.refine`      ``refine``;
* :mod:`pipeline.workflow.evaluate`    ``evaluate``;
* :mod:`pipeline.workflow.report`      ``report``.
"""
