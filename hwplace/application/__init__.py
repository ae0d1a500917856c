"""Layer 8, application: the job runner, plan reports and the ``hwplace`` command. Imports the layers below."""
