"""Text and tokens: the prompts of each role, the chat formats that render them, the tool-call parsers, and the OpenAI
chat API mapped onto them."""
