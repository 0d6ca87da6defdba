"""The online half: artifact contract, layer taps, monitors' runtime and the Kafka agent.

Light dependencies only (numpy, onnxruntime, kafka-python, prometheus-client, cryptography);
never imports the offline builder.
"""
