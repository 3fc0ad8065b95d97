"""The bundled demo: a calculator tool-use task with a verifiable reward."""
