"""Symmetry groups, specs, the canonical form and the Alignment object."""
from .alignment import Alignment, AlignmentMismatchError, check_same_arch, prepare_params, spec_for
from .canonical import canonical_params, to_canonical
from .elements import InvalidAlignmentError, apply_spec, random_element
from .fingerprint import model_fingerprint
from .spec import Axis, Group, Spec, canonical_spec, permutation_spec

__all__ = ["Alignment", "AlignmentMismatchError", "Axis", "Group", "InvalidAlignmentError", "Spec", "apply_spec",
           "canonical_params", "canonical_spec", "check_same_arch", "model_fingerprint", "permutation_spec",
           "prepare_params", "random_element", "spec_for", "to_canonical"]
