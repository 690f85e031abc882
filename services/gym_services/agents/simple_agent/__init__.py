"""The simple agent: model turns and tool calls until the model answers without a call, then /verify."""
