# Opt-in only: give flow runs back the `command` and `env` job variables that
# base-job-template.json leaves out (see README.md, "What a flow run may change").
# Anyone who can create a flow run on a pool made from the result can run any
# command in its pods, with the pool's service account and AWS secret.
.variables.additionalProperties = true
| .variables.properties.command = {"type": "string", "title": "Command"}
| .variables.properties.env = {"type": "object", "title": "Environment variables",
                               "additionalProperties": {"type": ["string", "null"]}}
| .job_configuration.command = "{{ command }}"
| .job_configuration.env = "{{ env }}"
| .job_configuration.job_manifest.spec.template.spec.containers[0].args = "{{ command }}"
| .job_configuration.job_manifest.spec.template.spec.containers[0].env = "{{ env }}"
