"""Lightning side: models assembled from plugins, LightningModules, DataModules, callbacks, MLflow glue."""
