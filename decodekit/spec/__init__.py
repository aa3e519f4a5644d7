"""The speculative wing: the modules of :func:`decodekit.generate`'s draft-verify loop.

* :mod:`~decodekit.spec.loop`: ``generate``, one batched loop for every drafter, verifier and length policy;
* :mod:`~decodekit.spec.state`: :class:`DecodeState`, what a component sees of the batch;
* :mod:`~decodekit.spec.round`: :class:`Round`, one verification forward's outputs, and ``NEEDS``;
* :mod:`~decodekit.spec.components`: the call's drafter, verifier and policy, checked together, their hooks
  dispatched (:mod:`~decodekit.spec.hooks`) and their outputs checked (:mod:`~decodekit.spec.component_checks`);
* :mod:`~decodekit.spec.options`, :mod:`~decodekit.spec.conventions`: the call's keywords and transformers'
  ``generate`` conventions (the batch of prompts is read by :mod:`~decodekit.models.prompts`, for both wings);
  :mod:`~decodekit.spec.processors`: logits processors and stop strings;
* :mod:`~decodekit.spec.outputs`: the growing outputs and their statistics;
* :mod:`~decodekit.spec.diagnostics`: where a speculative run first left plain decoding.

The components themselves live beside it (:mod:`decodekit.drafters`, :mod:`decodekit.verifiers`,
:mod:`decodekit.policies`); the diffusion wing is :mod:`decodekit.dlm`.
"""
