/* A remembered ccl/ops call, found and launched from C: the host path of a repeated small call.
 *
 * replay(state, name, first, second, rest, last) makes the key that iris.host.replay.call_key(name, first,
 * second, *rest, last) makes, looks it up among the remembered plans and, where the plan's graph can go out
 * as it is, launches it by the driver's cuGraphLaunch on the current stream (or, for a plan of one kernel packed
 * by iris.host.replay.direct, by cuLaunchKernel). It returns (key, plan)
 * when it launched, (key, None) when it did not (the caller's Python path then decides: a first call,
 * a first replay to capture, debug mode, a profiler's launch hook, a user's own capture, a plan whose
 * caller tensors are held weakly) and (None, None) where first or second is not a plain tensor (as
 * call_key). Built and loaded by iris/host/replay/native.py; see there for the state tuple.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef int (*graph_launch_fn)(void *executable, void *stream);          /* cuGraphLaunch */
typedef int (*stream_is_capturing_fn)(void *stream, int *capture_status); /* cuStreamIsCapturing */
typedef int (*kernel_launch_fn)(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                unsigned bz, unsigned shared, void *stream, void **params, void **extra);
                                                                            /* cuLaunchKernel */

enum { PLANS, TEAM, RUNTIME_KNOBS, TENSOR_TYPE, CURRENT_STREAM, IS_CAPTURING, GRAPH_LAUNCH, KERNEL_LAUNCH,
       STATE_SIZE };
/* a plan's native tuple: (graph executable, device), or one kernel packed once (iris.host.replay.direct):
 * (function, grid x, y, z, threads, shared bytes, parameter pointer array, device) */
enum { GRAPH_NATIVE = 2, KERNEL_NATIVE = 8 };

static PyObject *s_data_ptr, *s_shape, *s_is_contiguous, *s_stride, *s_dtype, *s_native, *s_tensors, *s_debug,
    *s_launch_enter_hook, *s_calls;

/* key[at .. at + 3] = t.data_ptr(), t.shape, t.is_contiguous() or t.stride(), t.dtype; -1 on error. */
static int put_tensor(PyObject *key, Py_ssize_t at, PyObject *t) {
    PyObject *value = PyObject_CallMethodNoArgs(t, s_data_ptr);
    if (value == NULL) return -1;
    PyTuple_SET_ITEM(key, at, value);
    if ((value = PyObject_GetAttr(t, s_shape)) == NULL) return -1;
    PyTuple_SET_ITEM(key, at + 1, value);
    if ((value = PyObject_CallMethodNoArgs(t, s_is_contiguous)) == NULL) return -1;
    if (value != Py_True) {
        Py_DECREF(value);
        if ((value = PyObject_CallMethodNoArgs(t, s_stride)) == NULL) return -1;
    }
    PyTuple_SET_ITEM(key, at + 2, value);
    if ((value = PyObject_GetAttr(t, s_dtype)) == NULL) return -1;
    PyTuple_SET_ITEM(key, at + 3, value);
    return 0;
}

/* call_key's tuple; Py_None (a new reference) where a tensor argument is not a plain tensor. */
static PyObject *make_key(PyObject *tensor_type, PyObject *name, PyObject *first, PyObject *second,
                          PyObject *rest, PyObject *last) {
    int two = second != Py_None;
    if (Py_TYPE(first) != (PyTypeObject *)tensor_type || (two && Py_TYPE(second) != (PyTypeObject *)tensor_type))
        Py_RETURN_NONE;
    Py_ssize_t extra = PyTuple_GET_SIZE(rest), fields = 1 + 4 * (1 + two);
    PyObject *key = PyTuple_New(fields + extra + 1);
    if (key == NULL) return NULL;
    Py_INCREF(name);
    PyTuple_SET_ITEM(key, 0, name);
    if (put_tensor(key, 1, first) < 0 || (two && put_tensor(key, 5, second) < 0)) {
        Py_DECREF(key);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < extra; i++) {
        PyObject *item = PyTuple_GET_ITEM(rest, i);
        Py_INCREF(item);
        PyTuple_SET_ITEM(key, fields + i, item);
    }
    Py_INCREF(last);
    PyTuple_SET_ITEM(key, fields + extra, last);
    return key;
}

/* 1 where the plan's graph may go out from here, 0 where the Python path must decide, -1 on error. */
static int launchable(PyObject *state, PyObject *plan, PyObject *native) {
    /* not captured yet, or launched by graph.replay (HIP); anything but our two tuples is not ours */
    if (!PyTuple_CheckExact(native) ||
        (PyTuple_GET_SIZE(native) != GRAPH_NATIVE && PyTuple_GET_SIZE(native) != KERNEL_NATIVE))
        return 0;
    PyObject *tensors = PyObject_GetAttr(plan, s_tensors);
    if (tensors == NULL) return -1;
    Py_ssize_t held = PyObject_Length(tensors);
    Py_DECREF(tensors);
    if (held != 0) return held < 0 ? -1 : 0; /* weakly held tensors: the Python path checks they live */
    PyObject *debug = PyObject_GetAttr(PyTuple_GET_ITEM(state, TEAM), s_debug);
    if (debug == NULL) return -1;
    int on = PyObject_IsTrue(debug);
    Py_DECREF(debug);
    if (on != 0) return on < 0 ? -1 : 0;
    PyObject *hook = PyObject_GetAttr(PyTuple_GET_ITEM(state, RUNTIME_KNOBS), s_launch_enter_hook);
    if (hook == NULL) return -1;
    if (hook == Py_None) {
        Py_DECREF(hook);
        return 1;
    }
    /* Triton 3.6 on keeps a chain of hooks: an empty one is no hook */
    PyObject *calls = PyObject_GetAttr(hook, s_calls);
    Py_DECREF(hook);
    if (calls == NULL) {
        PyErr_Clear();
        return 0;
    }
    int empty = PyList_CheckExact(calls) && PyList_GET_SIZE(calls) == 0;
    Py_DECREF(calls);
    return empty;
}

/* Launch the plan's graph or kernel on its device's current stream: 1 launched, 0 the stream is being captured,
 * -1 error. */
static int launch(PyObject *state, PyObject *native) {
    Py_ssize_t size = PyTuple_GET_SIZE(native);
    PyObject *stream_handle = PyObject_CallOneArg(PyTuple_GET_ITEM(state, CURRENT_STREAM),
                                                  PyTuple_GET_ITEM(native, size - 1));
    if (stream_handle == NULL) return -1;
    void *stream = PyLong_AsVoidPtr(stream_handle);
    Py_DECREF(stream_handle);
    stream_is_capturing_fn is_capturing = (stream_is_capturing_fn)PyLong_AsVoidPtr(
        PyTuple_GET_ITEM(state, IS_CAPTURING));
    if (PyErr_Occurred()) return -1;
    int status = 0, result = is_capturing(stream, &status);
    if (result != 0 || status != 0) return 0; /* the user's own capture takes the launches (Python path) */
    if (size == GRAPH_NATIVE) {
        void *executable = PyLong_AsVoidPtr(PyTuple_GET_ITEM(native, 0));
        graph_launch_fn graph_launch = (graph_launch_fn)PyLong_AsVoidPtr(PyTuple_GET_ITEM(state, GRAPH_LAUNCH));
        if (PyErr_Occurred()) return -1;
        if ((result = graph_launch(executable, stream)) != 0) {
            PyErr_Format(PyExc_RuntimeError, "cuGraphLaunch of a remembered call's graph failed: CUresult %d",
                         result);
            return -1;
        }
        return 1;
    }
    void *function = PyLong_AsVoidPtr(PyTuple_GET_ITEM(native, 0));
    unsigned long dims[5];
    for (int i = 0; i < 5; i++) dims[i] = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(native, 1 + i));
    void **params = (void **)PyLong_AsVoidPtr(PyTuple_GET_ITEM(native, 6));
    kernel_launch_fn kernel_launch = (kernel_launch_fn)PyLong_AsVoidPtr(PyTuple_GET_ITEM(state, KERNEL_LAUNCH));
    if (PyErr_Occurred()) return -1;
    if (kernel_launch == NULL) return 0;
    result = kernel_launch(function, (unsigned)dims[0], (unsigned)dims[1], (unsigned)dims[2], (unsigned)dims[3], 1,
                           1, (unsigned)dims[4], stream, params, NULL);
    if (result != 0) {
        PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel of a remembered call's kernel failed: CUresult %d", result);
        return -1;
    }
    return 1;
}

static PyObject *pair(PyObject *key, PyObject *plan) {
    PyObject *result = PyTuple_Pack(2, key, plan);
    Py_DECREF(key);
    return result;
}

static PyObject *replay(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != STATE_SIZE ||
        !PyTuple_CheckExact(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "replay(state, name, first, second, rest, last): a state tuple and a rest tuple");
        return NULL;
    }
    PyObject *state = args[0];
    PyObject *key = make_key(PyTuple_GET_ITEM(state, TENSOR_TYPE), args[1], args[2], args[3], args[4], args[5]);
    if (key == NULL) return NULL;
    if (key == Py_None) return pair(key, Py_None);
    PyObject *plan = PyDict_GetItemWithError(PyTuple_GET_ITEM(state, PLANS), key); /* borrowed */
    if (plan == NULL) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError)) {
                Py_DECREF(key);
                return NULL;
            }
            PyErr_Clear(); /* an unhashable argument: the Python path says what is wrong with it */
        }
        return pair(key, Py_None);
    }
    Py_INCREF(plan);
    PyObject *native = PyObject_GetAttr(plan, s_native);
    int ready = native == NULL ? -1 : launchable(state, plan, native);
    if (ready == 1) ready = launch(state, native);
    Py_XDECREF(native);
    if (ready < 0) {
        Py_DECREF(plan);
        Py_DECREF(key);
        return NULL;
    }
    PyObject *result = pair(key, ready ? plan : Py_None);
    Py_DECREF(plan);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(state, name, first, second, rest, last) -> (key, plan launched or None)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {PyModuleDef_HEAD_INIT, "iris_native_replay", NULL, -1, methods};

PyMODINIT_FUNC PyInit_iris_native_replay(void) {
    static const char *names[] = {"data_ptr", "shape",  "is_contiguous",      "stride", "dtype",
                                  "native",   "tensors", "debug", "launch_enter_hook", "calls"};
    PyObject **slots[] = {&s_data_ptr, &s_shape,   &s_is_contiguous, &s_stride,            &s_dtype,
                          &s_native,   &s_tensors, &s_debug,         &s_launch_enter_hook, &s_calls};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    return PyModule_Create(&definition);
}
