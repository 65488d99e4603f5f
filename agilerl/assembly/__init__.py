"""Assembly: a manifest (or a model name) turned into a running training job."""
