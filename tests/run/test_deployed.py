"""run/deployed.py's judgement of a deployed server, without a server: which model it serves."""

from autotune.run import deployed


def test_a_model_in_another_folder_is_the_same_model_and_another_name_is_not():
    moved = deployed.Seen(model="/models/Llama-3.1-8B-Instruct", root="/models/Llama-3.1-8B-Instruct")
    assert deployed.same_model("/data/hf/Llama-3.1-8B-Instruct", moved)  # a deployment's paths are its own
    assert deployed.same_model("meta-llama/Llama-3.1-8B-Instruct", moved)
    assert not deployed.same_model("Qwen/Qwen3.6-27B-AWQ", moved)
    served_as = deployed.Seen(model="chat", root="/models/Llama-3.1-8B-Instruct")  # --served-model-name chat
    assert deployed.same_model("/data/Llama-3.1-8B-Instruct", served_as)
