"""Writes kwok's pod controller with deletions that name the pod's UID.

kwok 0.8 deletes a pod by name alone. A StatefulSet recreates an evicted pod under the same
name within milliseconds, so kwok's pending deletion of the old pod removes the new one, and
under a burst of evictions pods churn for minutes. With the UID as a precondition the API
server refuses to delete the namesake (409), which is what the old pod's deletion means.

    python3 uid_precondition.py PATH/TO/pkg/kwok/controllers/pod_controller.go   # in place
"""

import sys
from pathlib import Path

ORIGINAL = """	err := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, deleteOpt)
	if err != nil {
		return err
	}
"""
PATCHED = """	opt := deleteOpt
	opt.Preconditions = metav1.NewUIDPreconditions(string(pod.UID))
	err := c.typedClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opt)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		logger.Debug("Pod gone or replaced by a namesake", "uid", pod.UID)
		return nil
	}
	if err != nil {
		return err
	}
"""
IMPORT = '\t"k8s.io/apimachinery/pkg/api/meta"\n'


def main(source: str) -> None:
    text = Path(source).read_text()
    if ORIGINAL not in text or IMPORT not in text:
        raise SystemExit(f"{source}: not the kwok pod controller this patch was written for")
    text = text.replace(ORIGINAL, PATCHED).replace(
        IMPORT, '\tapierrors "k8s.io/apimachinery/pkg/api/errors"\n' + IMPORT
    )
    Path(source).write_text(text)


if __name__ == "__main__":
    main(*sys.argv[1:])
