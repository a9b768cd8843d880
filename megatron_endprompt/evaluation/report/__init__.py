"""What a run writes: the JSON, markdown, heatmap and perplexity plot (``tables``), the
EndPrompt paper's layout and published numbers (``paper``), and the gate that says when a
number may stand beside the paper's (``protocol``)."""
